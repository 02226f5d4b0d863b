"""Engine replicas on Ray Serve: an engine deployment (one AsyncEngine per replica, one replica per GPU)
whose requests Ray Serve routes by model multiplexing on the adapter's runtime key, the remote
EngineClient the gateway uses to reach it, and the gateway ingress deployment in front
(docs/ARCHITECTURE.md, "platform/ray_serve"). Imported only when Ray is installed (extra `ray`)."""
