"""world: what a guest may reach outside itself, each access checked against the job's grants.

Owns: ``grants`` (read grants: a path walked from a granted root, no
``realpath``), ``files`` (open handles and bounded windows), ``documents`` and
``docworker`` (PDF pages and images, rendered in a child process that dies
with its host), ``fetch`` (HTTP under URL-prefix grants).
May import: ``abi``, ``limits``, ``text``, ``version``. Nothing above.
"""


__all__: list[str] = []
