"""The reconcile machinery shared by every controller: clocks, the work queue, result handling."""
