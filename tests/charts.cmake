# Benchmark charts (scripts/bench-chart.py): the SVG parses, is plain, and
# its points are the JSON's (the fixtures in tests/charts and the committed
# bench/results/issue15), placed where their values say. Python 3 standard
# library only; Debian's interpreter.
set(EVOKE_CHART_PYTHON /usr/bin/python3 CACHE FILEPATH "Python 3 for the chart tests")
add_test(NAME chart_test
  COMMAND ${EVOKE_CHART_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/charts/chart_test.py)
set_tests_properties(chart_test PROPERTIES LABELS charts TIMEOUT 120)

# The same check on the benchmarks' own --chart: evoke-bench runs two small
# cases against its own evoked and Redis; the recovery bench its 1,000-row
# case.
add_test(NAME chart_flags_e2e_test
  COMMAND ${EVOKE_CHART_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/charts/chart_test.py --e2e
          BenchChartFlagTest)
set_tests_properties(chart_flags_e2e_test PROPERTIES LABELS "charts;e2e" TIMEOUT 300
  ENVIRONMENT "EVOKE_BENCH=$<TARGET_FILE:evoke-bench>;EVOKE_RECOVERY_BENCH=$<TARGET_FILE:evoke_recovery_bench>")
