# The table printed by EXE (a generated docs table) must appear verbatim in DOC (regenerate the doc's table with
# the printer's output when what it lists changes).
execute_process(COMMAND ${EXE} OUTPUT_VARIABLE _table RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${EXE} failed (${_rc})")
endif()
file(READ ${DOC} _doc)
string(FIND "${_doc}" "${_table}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "${DOC} does not hold the current generated table; replace it with:\n${_table}")
endif()
