# QrunPlugin.cmake - qrun_add_plugin(): the one way to build a qrun plugin.
#
# In-tree plugins and third-party plugins (after find_package(qrun)) use this same function, so
# in-tree plugins get no privileges. It builds libqrun-<NAME>.so against the SDK, hides every
# symbol but the entry point, and stamps the descriptor with a build id and the CUDA major.
#
#   qrun_add_plugin(NAME hello-collator SOURCES hello.cpp [LIBRARIES extra...] [NO_INSTALL])
#
# Variables read: QRUN_PLUGIN_OUTPUT_DIR (where the .so goes in the build tree),
# QRUN_PLUGIN_INSTALL_DIR (install destination, default lib/qrun/plugins).
include_guard(GLOBAL)

function(qrun_plugin_build_id out_var src_dir)
  execute_process(COMMAND git -C "${src_dir}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE _rev OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _rc ERROR_QUIET)
  if(NOT _rc EQUAL 0 OR _rev STREQUAL "")
    set(_rev "nogit")
  endif()
  set(${out_var} "${_rev}" PARENT_SCOPE)
endfunction()

function(qrun_add_plugin)
  cmake_parse_arguments(P "NO_INSTALL" "NAME" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT P_NAME OR NOT P_SOURCES)
    message(FATAL_ERROR "qrun_add_plugin needs NAME and SOURCES")
  endif()
  if(NOT P_NAME MATCHES "^[a-z0-9]+(-[a-z0-9]+)*$")
    message(FATAL_ERROR "qrun_add_plugin: NAME '${P_NAME}' must be lowercase-kebab")
  endif()
  set(target qrun-${P_NAME})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE qrun::sdk ${P_LIBRARIES})
  qrun_plugin_build_id(_bid "${CMAKE_CURRENT_SOURCE_DIR}")
  set(_cuda_major 0)
  if(CMAKE_CUDA_COMPILER_VERSION)
    string(REGEX MATCH "^[0-9]+" _cuda_major "${CMAKE_CUDA_COMPILER_VERSION}")
  elseif(QRUN_SDK_CUDA_MAJOR)
    set(_cuda_major ${QRUN_SDK_CUDA_MAJOR})
  endif()
  target_compile_definitions(${target} PRIVATE
    QRUN_PLUGIN_BUILD_ID="${_bid}" QRUN_PLUGIN_CUDA_MAJOR=${_cuda_major})
  set_target_properties(${target} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(QRUN_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${QRUN_PLUGIN_OUTPUT_DIR}")
  endif()
  if(NOT QRUN_PLUGIN_INSTALL_DIR)
    set(QRUN_PLUGIN_INSTALL_DIR lib/qrun/plugins)
  endif()
  if(NOT P_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${QRUN_PLUGIN_INSTALL_DIR})
  endif()
endfunction()
