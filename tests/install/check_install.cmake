# cmake -P script: install into a scratch prefix, then use what was installed the ways a user
# would: a C++ consumer of every library (find_package COMPONENTS cxx), a C consumer of the C ABI
# through find_package with every dependency's package made unfindable and through pkg-config
# alone, the dashboards, and the Python package installed offline from python finding
# the installed library with no environment variable set at run time.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
run(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix})
set(extra)
if(CUDA_ROOT)
  list(APPEND extra -DCUDAToolkit_ROOT=${CUDA_ROOT})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}" ${extra})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
run(${WORK_DIR}/build/consumer)
message(STATUS "C++ consumer built against ${prefix} and ran")

# The C ABI needs nothing else: finding any dependency of the C++ libraries is made to fail.
set(no_deps)
foreach(package absl nlohmann_json prometheus-cpp PkgConfig CUDAToolkit Threads)
  list(APPEND no_deps -DCMAKE_DISABLE_FIND_PACKAGE_${package}=ON)
endforeach()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/c_consumer -B ${WORK_DIR}/c_build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${CC} -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_C_FLAGS=${C_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}" ${no_deps})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/c_build)
run(${WORK_DIR}/c_build/c_consumer)
message(STATUS "C consumer (find_package, no dependencies) ran: ${run_output}")

# pkg-config alone.
file(GLOB pc_dirs ${prefix}/lib*/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "${pc_dirs}")
run(pkg-config --cflags --libs stowage)
string(STRIP "${run_output}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
run(pkg-config --variable=libdir stowage)
string(STRIP "${run_output}" libdir)
separate_arguments(c_flags UNIX_COMMAND "${C_FLAGS} ${EXE_LINKER_FLAGS}")
run(${CC} ${c_flags} ${SOURCE_DIR}/tests/install/c_consumer/main.c ${pc_flags}
    -Wl,-rpath,${libdir} -o ${WORK_DIR}/c_consumer_pc)
run(${WORK_DIR}/c_consumer_pc)
message(STATUS "C consumer (pkg-config only) ran: ${run_output}")

file(GLOB dashboards ${prefix}/share/stowage/dashboards/*.json)
file(GLOB source_dashboards ${SOURCE_DIR}/dashboards/*.json)
list(LENGTH dashboards installed)
list(LENGTH source_dashboards expected)
if(NOT installed EQUAL expected OR installed EQUAL 0)
  message(FATAL_ERROR "share/stowage/dashboards has ${installed} dashboards, dashboards/ ${expected}")
endif()

# Python, offline: pip's isolated build with no index; the installed library is found through
# pkg-config at build time and bundled, so at run time no variable points at it.
if(PYTHON)
  set(site ${WORK_DIR}/site)
  file(COPY ${SOURCE_DIR}/python/ DESTINATION ${WORK_DIR}/python_src
       PATTERN "__pycache__" EXCLUDE PATTERN "libstowage.so*" EXCLUDE)
  run(${CMAKE_COMMAND} -E env --unset=STOWAGE_LIBRARY
      ${PYTHON} -m pip install --no-deps --no-index --disable-pip-version-check
      --target ${site} ${WORK_DIR}/python_src)
  # (A file, not -c: a CMake argument list would split the program at its semicolons.)
  file(WRITE ${WORK_DIR}/probe.py
       "import stowage\nfrom stowage import _lib\n_lib.load()\nprint(_lib.loaded_path())\n")
  run(${CMAKE_COMMAND} -E env --unset=STOWAGE_LIBRARY --unset=LD_LIBRARY_PATH PYTHONPATH=${site}
      ${PYTHON} ${WORK_DIR}/probe.py)
  string(STRIP "${run_output}" loaded)
  if(NOT loaded MATCHES "^${site}/stowage/libstowage\\.so")
    message(FATAL_ERROR "the installed package loaded '${loaded}', not its bundled library")
  endif()
  message(STATUS "Python package installed offline loads ${loaded}")
endif()
