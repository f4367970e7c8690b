#!/usr/bin/env node
// Inference latency of ONNX Runtime (npm onnxruntime-node) for bench/compare.
//
// Usage: node ort_infer.js MODULE_DIR MODEL.onnx THREADS ITERATIONS NAME=FILE.npy...
//   MODULE_DIR  folder holding node_modules/onnxruntime-node (outside the repo)
// Runs the model once as warm-up, then ITERATIONS times, and prints
//   "latency: median X ms, min Y ms, max Z ms over N iterations" (the format of popart-run).
'use strict';
const fs = require('fs');
const path = require('path');

function fail(msg) {
  process.stderr.write(`ort_infer: ${msg}\n`);
  process.exit(1);
}

// Minimal .npy reader: version 1/2/3 headers, little-endian f4 and i8, C order.
function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.toString('latin1', 1, 6) !== 'NUMPY') fail(`${file}: not a .npy file`);
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = buf.toString('latin1', major === 1 ? 10 : 12, start);
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const order = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !order || !shape) fail(`${file}: cannot parse the header ${header}`);
  if (order[1] === 'True') fail(`${file}: Fortran order is not supported`);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const bytes = buf.buffer.slice(buf.byteOffset + start, buf.byteOffset + buf.length);
  switch (descr[1]) {
    case '<f4': return {type: 'float32', data: new Float32Array(bytes, 0, count), dims};
    case '<i8': return {type: 'int64', data: new BigInt64Array(bytes, 0, count), dims};
    default: fail(`${file}: dtype ${descr[1]} is not supported (f4, i8 are)`);
  }
}

async function main() {
  const [moduleDir, model, threadsArg, itersArg, ...inputs] = process.argv.slice(2);
  if (!moduleDir || !model || !threadsArg || !itersArg) fail('usage: ort_infer.js MODULE_DIR MODEL THREADS ITERATIONS NAME=FILE...');
  const ort = require(path.join(moduleDir, 'node_modules', 'onnxruntime-node'));
  const threads = Number(threadsArg);
  const iterations = Number(itersArg);
  const feeds = {};
  for (const spec of inputs) {
    const eq = spec.indexOf('=');
    if (eq < 0) fail(`input '${spec}' is not NAME=FILE`);
    const a = readNpy(spec.slice(eq + 1));
    feeds[spec.slice(0, eq)] = new ort.Tensor(a.type, a.data, a.dims);
  }
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  });
  await session.run(feeds); // warm-up
  const ms = [];
  for (let i = 0; i < iterations; ++i) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  ms.sort((a, b) => a - b);
  const n = ms.length;
  const median = n % 2 ? ms[(n - 1) / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  const version = ort.env && ort.env.versions ? ort.env.versions.common || '' : '';
  console.log(`onnxruntime-node ${version}`);
  console.log(`latency: median ${median.toFixed(3)} ms, min ${ms[0].toFixed(3)} ms, max ${ms[n - 1].toFixed(3)} ms over ${n} iterations`);
}

main().catch((e) => fail(e && e.stack ? e.stack : String(e)));
