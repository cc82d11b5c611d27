"""Controllers: one small `reconcile(ctx, key)` per resource kind, and the manager wiring them."""
