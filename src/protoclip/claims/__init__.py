"""The claims ledger's rules, in one home: the claim engine (:mod:`.engine`: what each claim kind measures and
resamples), what is resampled of one evaluation (:mod:`.units`), a row's verdicts, the ledger-wide steps and the
first line's counts (:mod:`.rows`), the grids' claims (:mod:`.grid`), the verdict rules (:mod:`.ledger`),
bootstrap draws (:mod:`.bootstrap`), intervals, Holm and power (:mod:`.intervals`), their coverage
(:mod:`.coverage`) and the declarations' schema (:mod:`.config`). Below report/: the engine reads result files
through files/ and the objects it is handed; protoclip.report.ledger_table only writes and draws the rows."""
