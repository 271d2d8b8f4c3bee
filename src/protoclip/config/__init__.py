"""What every config section is built from: the strict YAML -> dataclass reader (strict), the protocols that the
packages below the assembler type their ``cfg`` with (protocols), and open_clip architectures read without torch
(architectures). The assembler that composes the sections, ``load_config`` and ``ProjectConfig``, is
:mod:`protoclip.project`; the JSON Schema generated from it is :mod:`protoclip.dag.schema`."""
