"""The manager's parts that sit below the platforms and the page: the HTTP
server keepers ship to, the SQLite store, and where experiments live on disk.
The experiment loop (trialkit.control) wires them together; nothing here
imports it."""
