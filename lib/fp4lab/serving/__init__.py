"""SGLang serving: launch configuration (``config``), the running server (``server``), log
classification (``logs``), benchmark clients (``bench``), a tiny offline model
(``tiny_model``) and the switch comparison notebook 08 runs (``compare``)."""
