"""Pure recipe → resources: schema, loading, validation, carving, expansion, plan output."""
