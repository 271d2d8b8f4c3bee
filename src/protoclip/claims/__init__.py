"""The claims ledger's arithmetic: bootstrap intervals (:mod:`.bootstrap`), the verdict rules (:mod:`.ledger`),
the claim declarations' schema (:mod:`.config`). Pure: no project config, DAG or tracking; the report reads the
result files and draws the ledger (protoclip.report.claims)."""
