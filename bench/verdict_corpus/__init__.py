"""The verdict corpus (issue 42): recordings of parameterised workloads by a real `leaktrace hunt`, each
process's truth from its own bookkeeping, cut into labelled windows and replayed through the analysis.

plan.py: which workloads make each split; record.py: runs them under one hunt and stores the tables the
verdict reads; windows.py: labelled windows and their offline replay; score.py: the figures of the bench."""
