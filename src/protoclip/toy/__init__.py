"""Small synthetic experiments that run on CPU in about a minute (PAUC's NEMD toy: :mod:`protoclip.toy.pauc_nemd`)."""
