"""Cluster hunt: the same `leaktrace hunt` on every selected node of a Ray cluster, merged into one report.

Ray is the transport (the engine vLLM deployments already run), nothing more: one task per node, pinned
there with hard node affinity, runs ``python -m leaktrace hunt`` as a subprocess with the same options
everywhere, and hands the node's session directory back (tar bytes through the object store, or written
to a path shared by every node). The caller unpacks each into ``OUT/nodes/<node>/`` (an ordinary session
that ``leaktrace report`` re-renders) and merges the node reports into ``OUT/report.json`` and
``OUT/report.md``. A node that fails (no target, target gone, task or node died, no answer in time) is
listed with its reason; the other nodes' results stay.

Cluster session layout::

    OUT/cluster.json          what was asked (address, targets, hunt options) and what each node answered
    OUT/nodes/<node>/         one session directory per node that answered with one
    OUT/report.json, .md      the merged report (schema leaktrace.report/1 plus ``nodes`` and more)

Ray is imported only on the driver side of ``cluster hunt``; merging and ``cluster report`` work without it.

Modules, one per stage: ``request`` (what the user asked: targets, nodes, options), ``node`` (the task
body on each node), ``driver`` (Ray: connect, fan out, collect, Ctrl-C), ``merge`` (node reports into
one) and ``markdown`` (the merged report as Markdown).
"""
