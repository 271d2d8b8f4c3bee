"""Building the corpus at prepare time: the pinned packages and user data -> captioned images, de-duplicated and
split, written as the manifest and the offline eval sets (:func:`prepare.prepare_corpus`; the stage's entry is
:func:`protoclip.data.stage.run_prepare`)."""
