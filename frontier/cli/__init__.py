"""The `fab` task namespace, assembled from one module per Fabric collection.

Tasks are thin: they parse options, load the stack, call into the library and print tables.
"""

from invoke import Collection

from frontier.cli import access, ami, config, keys, local, ops, provision, restore, soak, spot, verify

namespace = Collection()
for module in (config, provision, ops, ami, local, spot, access, verify, keys, soak, restore):
    module.register(namespace)
