# evr_install_pkg_config(NAME FLAVOUR FLAVOUR_CFLAGS ASIO_INCLUDE): installs <libdir>/pkgconfig/NAME.pc
# for one Asio flavour of evr's front end.
#
# The file is written at install time (install(CODE)), so that `prefix` is the prefix actually
# installed to, also with `cmake --install --prefix <dir>`; DESTDIR is honoured. Cflags carry the
# flavour's macros, EVR_WITH_CUDA and the CUDA runtime's headers when evr was built with CUDA, and
# the Asio folder when it is not a system one; Libs carry libevr, threads and the CUDA runtime (static or shared, as
# EVR_CUDA_RUNTIME chose).
# A moved prefix: pkg-config --define-variable=prefix=<new prefix> ...

function(evr_install_pkg_config name flavour flavour_cflags asio_include)
  set(cflags "${flavour_cflags}")
  set(libs "-pthread")
  if(asio_include AND NOT asio_include MATCHES "^/usr(/local)?/include/?$")
    string(APPEND cflags " -isystem ${asio_include}")
  endif()
  if(EVR_HAVE_CUDA)
    string(APPEND cflags " -DEVR_WITH_CUDA=1")
    foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
      string(APPEND cflags " -I${dir}")
    endforeach()
    # The runtime as evr links it (EVR_CUDA_RUNTIME): the static one needs libdl and librt.
    if(EVR_CUDA_RUNTIME STREQUAL "static")
      string(APPEND libs " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
    else()
      string(APPEND libs " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
    endif()
  endif()

  # libdir and includedir relative to ${prefix} when the install folders are relative.
  foreach(kind LIBDIR INCLUDEDIR)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
      set(EVR_PC_${kind} "${CMAKE_INSTALL_${kind}}")
    else()
      set(EVR_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
    endif()
  endforeach()
  set(EVR_PC_NAME "${name}")
  set(EVR_PC_FLAVOUR "${flavour}")
  set(EVR_PC_CFLAGS "${cflags}")
  set(EVR_PC_LIBS "${libs}")
  set(EVR_PC_PREFIX "@EVR_PC_PREFIX@")  # kept for the install-time pass below
  set(stage "${CMAKE_CURRENT_BINARY_DIR}/pkgconfig")
  configure_file("${CMAKE_CURRENT_FUNCTION_LIST_DIR}/evr.pc.in" "${stage}/${name}.pc.in" @ONLY)

  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(destination "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  else()
    set(destination "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  endif()
  install(CODE "
    set(EVR_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
    configure_file(\"${stage}/${name}.pc.in\" \"${stage}/${name}.pc\" @ONLY)
    file(INSTALL DESTINATION \"${destination}\" TYPE FILE FILES \"${stage}/${name}.pc\")
  ")
endfunction()
