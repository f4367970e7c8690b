# Fails if ir/ includes oneDNN or onnx headers, or backend_cpu/ includes onnx headers, or the
# reference kernels use the fast or oneDNN ones or vector code, or the fast kernels use oneDNN,
# or a widely included header pulls in onnx/protobuf.
file(GLOB_RECURSE IR_FILES ${SOURCE_DIR}/ir/*.hpp ${SOURCE_DIR}/ir/*.cpp)
file(GLOB_RECURSE BACKEND_FILES ${SOURCE_DIR}/backend_cpu/*.hpp ${SOURCE_DIR}/backend_cpu/*.cpp)
file(GLOB_RECURSE HEADERS ${SOURCE_DIR}/include/*.hpp ${SOURCE_DIR}/core/*.hpp ${SOURCE_DIR}/session/*.hpp
  ${SOURCE_DIR}/onnx_import/*.hpp)
set(bad "")
# Appends to bad each file given after the pattern that has a line matching it.
function(check_files pattern)
  foreach(f ${ARGN})
    file(STRINGS ${f} lines REGEX "${pattern}")
    if(lines)
      list(APPEND bad "${f}: ${lines}")
    endif()
  endforeach()
  set(bad ${bad} PARENT_SCOPE)
endfunction()
check_files("#include [<\"](onnx/|oneapi/|dnnl|google/protobuf)" ${IR_FILES})
check_files("#include [<\"](onnx/|google/protobuf|onnx_import/)" ${BACKEND_FILES})
# The reference kernels are the oracle the fast and oneDNN kernels are tested against: plain
# loops that use neither of them nor vector intrinsics.
file(GLOB_RECURSE REFERENCE_FILES ${SOURCE_DIR}/backend_cpu/reference/*.hpp ${SOURCE_DIR}/backend_cpu/reference/*.cpp)
check_files("#include [<\"](backend_cpu/fast/|backend_cpu/dnnl/|oneapi/|dnnl|[a-z]*intrin)|target_clones|omp simd"
  ${REFERENCE_FILES})
# The fast kernels are oneDNN-free.
file(GLOB_RECURSE FAST_FILES ${SOURCE_DIR}/backend_cpu/fast/*.hpp ${SOURCE_DIR}/backend_cpu/fast/*.cpp)
check_files("#include [<\"](backend_cpu/dnnl/|oneapi/|dnnl)" ${FAST_FILES})
check_files("#include [<\"](onnx/|google/protobuf|oneapi/)" ${HEADERS})
if(bad)
  message(FATAL_ERROR "layering violations:\n${bad}")
endif()
message(STATUS "layering: ir/ and backend_cpu/ include only what they may")
