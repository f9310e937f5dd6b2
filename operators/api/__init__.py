"""The job API: operators (``on_event``/``on_timer_expired`` and ``BatchOperator``), state
specs, codecs, the ``Job`` definition, its validation and key groups. No PySpark import."""
