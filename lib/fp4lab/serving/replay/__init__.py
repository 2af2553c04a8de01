"""SGLang's own models through each release's prefill graph runners, split along the process
boundary: the modules here run on the notebook's side (they build the release environments, start
the children, decide, tabulate and plot); ``release/`` runs inside a release's environment (the
children ``release.child`` and ``release.split_check``); ``shared/`` holds the rules and data both
sides read."""
