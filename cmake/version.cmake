# Writes the generated version header (-DIN, -DOUT, -DPROJECT_VERSION, -DSOURCE_DIR) with the
# current `git describe`, at build time so that --version names the commit the binary was built
# from, not the one CMake last configured. configure_file leaves OUT untouched when nothing
# changed, so an unchanged revision recompiles nothing.
execute_process(COMMAND git describe --always --dirty
  WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE KTIER_GIT_REV
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT KTIER_GIT_REV)
  set(KTIER_GIT_REV "unknown")
endif()
configure_file(${IN} ${OUT} @ONLY)
