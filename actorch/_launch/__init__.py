"""Layer 5, launching: ``run()``, the bounded event loop and the watchdog, and logging set-up."""
