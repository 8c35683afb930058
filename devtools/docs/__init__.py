"""The documentation site's generated parts (``make docs`` runs ``python -m devtools.docs``).

One module per generated reference page, each with ``PAGE`` (where the page lives under
``docs/``) and ``render() -> str`` (the page's markdown, from the code it documents):

* :mod:`devtools.docs.configref`: the driver configuration, from its pydantic models;
* :mod:`devtools.docs.helmref`: the Helm values, from the chart's ``values.schema.json``
  and ``values.yaml``;
* :mod:`devtools.docs.metricsref`: the metrics, from the metric declarations in the code;
* :mod:`devtools.docs.cliref`: the commands, from their ``--help``.

:mod:`devtools.docs.diagrams` renders the diagrams' sources (``docs/diagrams/*.seq``,
``*.layers``) to SVG, and :mod:`devtools.docs.runnable` finds the commands the pages mark
as runnable. A unit test per page fails when the committed page and ``render()`` differ.
"""
