# Finds cuDNN 9 for the CUDA engine: KILN_CUDNN_INCLUDE_DIR (cudnn.h) and KILN_CUDNN_LIBRARY
# (libcudnn.so.9). Looked for, in order: -DKILN_CUDNN_ROOT=<dir holding include/ and lib/>,
# the nvidia-cudnn wheel of a Python that has one (-DKILN_PYTHON, the project's .venv, then
# python3 on PATH), and the CUDA toolkit's own directories. A CUDA build without it fails here.
set(KILN_CUDNN_ROOT "" CACHE PATH "Directory holding cuDNN 9's include/cudnn.h and lib/libcudnn.so.9")
set(KILN_PYTHON "" CACHE FILEPATH "A Python whose site-packages may hold the nvidia-cudnn wheel")

set(_kiln_cudnn_hints)
if(KILN_CUDNN_ROOT)
  list(APPEND _kiln_cudnn_hints "${KILN_CUDNN_ROOT}")
endif()
set(_kiln_pythons ${KILN_PYTHON} "${CMAKE_SOURCE_DIR}/.venv/bin/python")
find_program(_kiln_python3 NAMES python3 python)
if(_kiln_python3)
  list(APPEND _kiln_pythons "${_kiln_python3}")
endif()
foreach(_py IN LISTS _kiln_pythons)
  if(_py AND EXISTS "${_py}")
    execute_process(
      COMMAND "${_py}" -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _kiln_wheel_dir OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _kiln_py_rc ERROR_QUIET)
    if(_kiln_py_rc EQUAL 0 AND EXISTS "${_kiln_wheel_dir}")
      list(APPEND _kiln_cudnn_hints "${_kiln_wheel_dir}")
    endif()
  endif()
endforeach()

# The toolkit directories last: the header ships there on some machines, the library in a wheel.
set(_kiln_include_hints)
set(_kiln_lib_hints)
foreach(_dir IN LISTS _kiln_cudnn_hints)
  list(APPEND _kiln_include_hints "${_dir}/include")
  list(APPEND _kiln_lib_hints "${_dir}/lib" "${_dir}/lib64")
endforeach()
find_path(KILN_CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_kiln_include_hints} ${CUDAToolkit_INCLUDE_DIRS} NO_CMAKE_SYSTEM_PATH)
find_path(KILN_CUDNN_INCLUDE_DIR cudnn.h)
find_library(KILN_CUDNN_LIBRARY NAMES libcudnn.so.9 cudnn NAMES_PER_DIR
  HINTS ${_kiln_lib_hints} ${CUDAToolkit_LIBRARY_DIR} NO_CMAKE_SYSTEM_PATH)
find_library(KILN_CUDNN_LIBRARY NAMES libcudnn.so.9 cudnn NAMES_PER_DIR)

if(NOT KILN_CUDNN_INCLUDE_DIR OR NOT KILN_CUDNN_LIBRARY)
  message(FATAL_ERROR "kiln: the CUDA engine needs cuDNN 9 (cudnn.h: '${KILN_CUDNN_INCLUDE_DIR}', "
    "libcudnn.so.9: '${KILN_CUDNN_LIBRARY}'). Install the nvidia-cudnn-cu${CUDAToolkit_VERSION_MAJOR} "
    "wheel into the Python given by -DKILN_PYTHON, pass -DKILN_CUDNN_ROOT=<dir with include/ and "
    "lib/>, or configure with -DKILN_WITH_CUDA=OFF")
endif()
file(STRINGS "${KILN_CUDNN_INCLUDE_DIR}/cudnn_version.h" _kiln_cudnn_major REGEX "^#define CUDNN_MAJOR ")
string(REGEX REPLACE "^#define CUDNN_MAJOR ([0-9]+).*" "\\1" _kiln_cudnn_major "${_kiln_cudnn_major}")
if(NOT _kiln_cudnn_major STREQUAL "9")
  message(FATAL_ERROR "kiln: ${KILN_CUDNN_INCLUDE_DIR}/cudnn.h is cuDNN ${_kiln_cudnn_major}, the CUDA "
    "engine needs cuDNN 9; point -DKILN_CUDNN_ROOT at a cuDNN 9 install")
endif()
message(STATUS "kiln: cuDNN ${_kiln_cudnn_major}: ${KILN_CUDNN_INCLUDE_DIR}, ${KILN_CUDNN_LIBRARY}")
