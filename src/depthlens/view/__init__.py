"""``depthlens view``: a read-only page over a store — questions, responses, each token's depth, Think@n live.

``access`` reads a store on demand (a few columns of every row, or every column of one row); ``store`` opens a
store of any kind depthlens writes and says what is damaged; ``pools`` votes with the library's own code;
``detail`` assembles one response's tokens and layers; ``app`` is the JSON API and the page; ``server`` binds
and runs it. Nothing here writes into a store.
"""
