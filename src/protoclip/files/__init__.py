"""A run's files and their integrity: where each lives (layout), how it is written (atomic), when a folder counts as
complete (completion), the result formats (records), reading another stage's files (datafiles), and what produced
them (hashing, provenance)."""
