"""``python -m tensorjob_jupyter ...`` is the ``tensorjob`` command, found through the interpreter itself.

A notebook kernel started as ``.venv/bin/jupyter lab`` without activating the environment has no ``tensorjob`` on
its PATH; ``!{sys.executable} -m tensorjob_jupyter`` reaches the command of the kernel's own environment.
"""

from tensorjob_jupyter.frontends.cli import main

raise SystemExit(main())
