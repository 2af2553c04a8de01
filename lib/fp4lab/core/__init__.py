"""What every experiment shares: paths, records (the only writer of data/), parameter checks,
timing, child processes, the machine probe and the notebook catalog. Knows no experiment."""
