package natssem

import "strconv"

// Resource names of a semaphore called name.
const (
	streamPrefix = "TOKENSEM_" // token stream: TOKENSEM_<name>
	bucketPrefix = "tokensem_" // KV bucket:   tokensem_<name>
	consumerName = "holders"

	// A group's resources. The prefixes differ from a lone semaphore's
	// at a character a name cannot hold in that place ('_' against a
	// letter), so no semaphore's resources can be a group's.
	groupStreamPrefix   = "TOKENSEMG_" // TOKENSEMG_<group>
	groupBucketPrefix   = "tokensemg_" // tokensemg_<group>
	groupConsumerPrefix = "holders_"   // holders_<key>, one per key
)

// Resources names the broker resources of one semaphore: what an operator
// grants rights on (docs/permissions-nats.md) and watches.
type Resources struct {
	Stream    string // the token stream (a group's is shared by its keys)
	Subject   string // the subject of the semaphore's tokens
	Consumer  string // the durable pull consumer its holders take tokens from
	Bucket    string // the KV bucket of its configuration, slot records and lock (a group's is shared)
	KeyPrefix string // the prefix of its records' keys in the bucket: "" alone, "<name>." in a group
}

// ResourcesOf returns the resources of semaphore name, or of key name of
// group (WithGroup) when group is not "". It checks neither name.
func ResourcesOf(name, group string) Resources {
	l := newLayout(group, name)
	return Resources{Stream: l.stream, Subject: l.subject, Consumer: l.consumer, Bucket: l.bucket, KeyPrefix: l.prefix}
}

// layout names the broker resources of one semaphore: a stream, consumer
// and bucket of its own, or its share of its group's (a subject, a
// consumer filtered on it, and the records under a key prefix).
type layout struct {
	group    string // "" for a semaphore of its own
	stream   string
	bucket   string
	subject  string // of its tokens
	consumer string // durable pull consumer of its holders
	prefix   string // of its KV keys: "" alone, "<key>." in a group
}

func newLayout(group, name string) layout {
	if group == "" {
		return layout{stream: streamPrefix + name, bucket: bucketPrefix + name, subject: "tokensem." + name + ".tokens", consumer: consumerName}
	}
	return layout{
		group: group, stream: groupStreamPrefix + group, bucket: groupBucketPrefix + group,
		subject: "tokensemg." + group + "." + name + ".tokens", consumer: groupConsumerPrefix + name, prefix: name + ".",
	}
}

// grouped reports whether the semaphore shares its group's resources.
func (l layout) grouped() bool { return l.group != "" }

// configVersion is the version a new configuration gets: a key of a
// group bumps its group's generation (generation.go).
func (l layout) configVersion() int {
	if l.grouped() {
		return configVersionGen
	}
	return configVersion
}

// key returns the KV key of the semaphore's record k.
func (l layout) key(k string) string { return l.prefix + k }

// slotKey returns the KV key of slot index's record.
func (l layout) slotKey(index int) string { return l.key(slotPrefix + strconv.Itoa(index)) }

// kvSubject returns the subject of the semaphore's record k in the
// bucket's stream.
func (l layout) kvSubject(k string) string { return l.bucketSubject(l.key(k)) }

// bucketSubject returns the subject of the bucket's record key (a full KV
// key, such as the group's generationKey) in the bucket's stream.
func (l layout) bucketSubject(key string) string { return "$KV." + l.bucket + "." + key }

// kvStream returns the name of the stream behind the bucket.
func (l layout) kvStream() string { return "KV_" + l.bucket }

// msgID returns the message ID of a token the semaphore publishes, id
// being its ID for a semaphore of its own (the stream deduplicates IDs
// within its duplicate window). A group's stream outlives its semaphores,
// and a key deleted and made again within that window must not have its
// tokens dropped as duplicates of its earlier life's: in a group the ID
// names the key and its life (config.Epoch) too.
func (l layout) msgID(name string, epoch uint64, id string) string {
	if !l.grouped() {
		return id
	}
	return name + "." + strconv.FormatUint(epoch, 10) + "." + id
}
