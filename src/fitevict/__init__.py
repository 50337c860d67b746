"""fitevict: price, plan, supervise and serve local models within a memory budget."""
__version__ = "0.1.0"
