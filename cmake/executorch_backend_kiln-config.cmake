# executorch_backend_kiln-config.cmake: the imported target executorch::backend_kiln, Kiln's
# ExecuTorch delegate library. Usage:
#
#   find_package(executorch REQUIRED)
#   find_package(executorch_backend_kiln REQUIRED)
#   target_link_libraries(app PRIVATE executorch::backend_kiln ...)
#
# The library is this package's own copy, one directory above this file
# (<dir>/libexecutorch_backend_kiln.so beside <dir>/cmake/). Nothing else is searched: a
# library of the same name in a parent directory or a system path is never picked up.
get_filename_component(_kiln_package_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(_kiln_library "${_kiln_package_dir}/libexecutorch_backend_kiln.so")

if(NOT EXISTS "${_kiln_library}")
  set(executorch_backend_kiln_FOUND FALSE)
  string(CONCAT executorch_backend_kiln_NOT_FOUND_MESSAGE
    "libexecutorch_backend_kiln.so is missing from ${_kiln_package_dir}, where this package "
    "keeps it: reinstall kiln-runtime (or rebuild and reinstall Kiln)")
  unset(_kiln_package_dir)
  unset(_kiln_library)
  return()
endif()

if(NOT TARGET executorch::backend_kiln)
  add_library(executorch::backend_kiln SHARED IMPORTED)
  set_target_properties(executorch::backend_kiln PROPERTIES
    IMPORTED_LOCATION "${_kiln_library}"
    IMPORTED_SONAME "libexecutorch_backend_kiln.so")
  # The application references none of its symbols; --no-as-needed keeps it a dependency so
  # that it loads, and its static initializer registers KilnBackend.
  set_property(TARGET executorch::backend_kiln APPEND PROPERTY INTERFACE_LINK_OPTIONS
    "LINKER:--push-state,--no-as-needed,${_kiln_library},--pop-state")
  if(TARGET executorch::runtime)
    set_property(TARGET executorch::backend_kiln APPEND PROPERTY
      INTERFACE_LINK_LIBRARIES executorch::runtime)
  endif()
endif()

set(executorch_backend_kiln_FOUND TRUE)
unset(_kiln_package_dir)
unset(_kiln_library)
