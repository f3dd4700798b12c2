"""The dataset layer: a container read as records (``reader``, ``records``, ``batch``,
``verify``) and written as records (``writer``, ``append``, ``columns``), whatever physical
variant holds it. Field names (``fields``) and index rules (``indexing``) serve both sides.
The public names are re-exported by ``evalue_store`` itself."""
