"""The claims ledger's arithmetic: bootstrap draws over test examples and seeds (:mod:`.bootstrap`), intervals
with a small-sample seed correction, Holm and power (:mod:`.intervals`), their coverage by simulation
(:mod:`.coverage`), the verdict rules (:mod:`.ledger`), the claim declarations' schema (:mod:`.config`). Pure: no
project config, DAG or tracking; the report reads the result files and draws the ledger
(protoclip.report.ledger_table)."""
