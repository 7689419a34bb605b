// Package embedded runs a NATS server with JetStream inside the current
// process: the local default of tokensem, used by its tests, examples and
// `seminit server`. It listens on loopback unless told otherwise, fsyncs
// every write to a store you keep (see Config.Sync), and can be one node
// of a NATS cluster (Config.ClusterListen); a cluster node's JetStream
// answers once a meta leader is elected (Server.WaitJetStream).
package embedded
