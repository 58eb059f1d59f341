"""What a run leaves behind, read back: the summary metrics and tables (``metrics``, ``summary``,
``tables``, ``writing``), the figures (``plots``), the HTML report (``report``), the notebook
shortcuts (``accessor``) and the audit of a saved run (``saved``)."""
