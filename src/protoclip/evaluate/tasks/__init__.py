"""The evaluation tasks, one module each: its :class:`protoclip.tasks.Task` (registered as the module is imported,
:func:`protoclip.tasks.load_tasks`), its adapter, its settings section ``evaluate.<name>``, its minimum-data
rule and its chance level; :mod:`.base` holds what every adapter reads and returns. Adding a task is adding a
module here (and its metric function under :mod:`protoclip.evaluate.metrics`)."""
