"""The tracking stage: MLflow holds every sweep and cell; the writer, the store's readers, its snapshot, live progress, and the cell journal it logs. Imports: planner and below."""
