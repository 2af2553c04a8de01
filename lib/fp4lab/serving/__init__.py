"""SGLang serving, run from SGLang's own environment (``sglang_env``, with the CPU ``standins``
it may need): the options its parsers really have (``cli``, ``read_parser``), launch
configuration (``config``), the running server (``server``), requests (``client``), log
classification (``logs``), benchmark clients (``bench``), its MSCCL++ API (``mscclpp_api``), a
tiny offline model (``tiny_model``), the live CPU server (``live``, ``cpu_benchmark``) and the
switch comparison notebook 08 runs (``compare``)."""
