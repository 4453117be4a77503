"""What the backend reads from Dynamo's FX graphs beyond the graph itself: node metadata and the module
lookup (:mod:`.dynamo`), graph breaks and checkpoint bodies (:mod:`.structure`); and the graphs recorded
for tests (:mod:`.recording`)."""
