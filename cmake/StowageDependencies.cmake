# Third-party dependencies, all from Debian packages (scripts/setup-deps installs them).
find_package(absl REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(prometheus-cpp REQUIRED COMPONENTS core)
find_package(PkgConfig REQUIRED)
pkg_check_modules(hwloc REQUIRED IMPORTED_TARGET GLOBAL hwloc)
pkg_check_modules(numa REQUIRED IMPORTED_TARGET GLOBAL numa)
pkg_check_modules(jemalloc REQUIRED IMPORTED_TARGET GLOBAL jemalloc)
find_package(Threads REQUIRED)
# xxHash, used header-only (XXH_INLINE_ALL) by the plan hash, so nothing is linked or exported.
find_path(STOWAGE_XXHASH_INCLUDE_DIR xxhash.h REQUIRED DOC "xxHash header (Debian libxxhash-dev)")
# toml++ (libtomlplusplus-dev): the CLI reads torchtitan job configs (`stowage plan
# --from-torchtitan`), which are TOML; a full TOML 1.0 parser with line numbers in its errors,
# packaged by Debian, rather than a second hand-written reader. Only the CLI links it (its shared
# library), never libstowage.so.
find_package(tomlplusplus 3 REQUIRED)
