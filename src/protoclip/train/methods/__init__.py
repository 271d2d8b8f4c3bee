"""Training methods of the episodic trainer (see :mod:`protoclip.train.methods.base` for the protocol).

Importing this package registers every shipped method in ``METHODS``.
"""
from protoclip.train.methods.base import METHODS, EpisodeData, Method, MultiView, build_method, method_class
from protoclip.train.methods import clip as _clip  # noqa: F401  (registers "clip")
from protoclip.train.methods import protoclip as _protoclip  # noqa: F401  (registers "protoclip")
from protoclip.train.methods import nclip as _nclip  # noqa: F401  (registers "nclip", "xclip")
from protoclip.train.methods import pcl as _pcl  # noqa: F401  (registers "pcl")

__all__ = ["METHODS", "EpisodeData", "Method", "MultiView", "build_method", "method_class"]
