"""The reproducibility machinery: what every run needs beside its arithmetic, kept out of the estimator core.

- ``setpo.records``: what runs print, time and write (markdown tables, progress bars, atomic JSON files,
  JSONL records, benchmark reports).
- ``setpo.refusals``: refusing a file that cannot be loaded in one shape, the file (relative to its run
  folder) and what to do first, then a short cause in the package's own words, never a library's text.
- ``setpo_lab.repro.provenance``: what made a result (thread count, the code's meaning, package versions, the
  pinned arithmetic) as one identity, and what differs between two.
- ``setpo_lab.repro.arithmetic``: the pinned floating-point path; ``python -m setpo_lab.repro.arithmetic COMMAND`` runs a
  command on it.
- ``setpo_lab.repro.agreement``: where each row of a Countdown record came from (the processors that trained and
  evaluated it, digests of its weights and counts) and how much of two study folders is the same bit for bit.
- ``setpo_lab.repro.at_commit``: the code of another commit, in a temporary git worktree: the code a record names,
  which checks the record before it is re-stamped (``setpo_lab.studies.countdown_record``).

A layer above the core (``setpo/*.py``: pure functions over tensors, no process, git or file system) and below
the engine adapters and the studies (``tests/test_layers.py``). Nothing here is part of a study's code identity
(``provenance.MACHINERY``).
"""
