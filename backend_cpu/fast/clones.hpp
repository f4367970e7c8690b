#pragma once
// POPART_CLONES: compile a loop for AVX-512 (x86-64-v4), AVX2 (x86-64-v3) and the baseline, the
// loader picking the best the CPU has (GCC's target_clones), so that the binary stays portable.

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer instruments the clones' resolver, which the dynamic loader runs before TSan's
// runtime is ready (a crash at start-up): the default version alone in TSan builds.
#define POPART_CLONES
#elif defined(__clang__)
// Clang 14's resolver does not know the "arch=x86-64-vN" levels: it tests a CPU model field
// instead and picked the AVX-512 clone on an AVX2-only CPU (SIGILL in the sanitizer build). Clang
// builds (the sanitizer and fuzzing build) get the default version alone.
#define POPART_CLONES
#else
#define POPART_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
