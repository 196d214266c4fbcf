"""What is kept on disk: the store (SQLite and blobs), bundles, export, model files, secrets and the
flywheel's routes."""
