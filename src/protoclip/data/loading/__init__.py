"""Reading the corpus at training and evaluation time: the manifest's format, image reading, the pairs dataset,
the transforms and the batched augmentation on the device. Imports nothing of :mod:`protoclip.data.corpus`."""
