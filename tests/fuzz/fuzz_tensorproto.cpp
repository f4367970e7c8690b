// libFuzzer target: the serialized TensorProto reader (the ONNX test data's .pb files, and
// popart-run --input).

#include "fuzz_input_file.hpp"
#include "onnx_import/onnx_import.hpp"

#include <popart/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = popart::fuzz::writeInputFile(data, size, "input.pb");
  try {
    popart::onnx_import::readTensorProtoFile(path);
  } catch (const popart::error &e) {
    popart::fuzz::expectedError(e);
  }
  return 0;
}
