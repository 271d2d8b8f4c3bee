"""Training methods of the episodic trainer: one module per method (the protocol: :mod:`.base`).

Every module of this package is imported by :func:`protoclip.registry.load_methods` the first time the
registry is asked, and registers its methods with ``@register``: adding a method is adding a module here.
"""
