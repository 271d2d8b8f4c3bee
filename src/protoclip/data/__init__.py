"""The `prepare` stage's package: `config.py` (its config section) and `stage.py` (its command) on top of two rooms,
`corpus/` (prepare time: sources -> rendered images, captions, de-duplication, split, manifest, eval sets) and
`loading/` (training and evaluation time: the manifest's reader, image reading, transforms, augmentation).
`corpus` imports `loading` (the manifest format lives with its reader), never the other way round."""
