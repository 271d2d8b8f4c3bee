"""Building the corpus at prepare time: the pinned packages and user data -> captioned images, de-duplicated and
split, written as the manifest and the offline eval sets (entry: :func:`prepare.run_prepare`)."""
