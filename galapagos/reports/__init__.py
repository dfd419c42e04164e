"""What a run amounts to and how it shows: summaries as data and text (``summary``), the journal as a table
(``tables``), the HTML report (``html``), TensorBoard/MLflow tracking (``tracking``) and the live progress
(``progress``)."""
