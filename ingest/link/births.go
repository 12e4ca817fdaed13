package link

// Births is the broker-of-last-birth rule of a broker pool, for every
// reader of the pool's presence (the ingest pipeline's state, Presence's
// view, the alarm evaluator): per online device the broker its last birth
// came from; a will counts only from that broker. A device that moves
// from broker A to broker B (its connection to A lost, its birth on B)
// can have its birth on B arrive before A publishes its will, which A does
// only once the lost connection's keep-alive expires: that will is stale
// and changes nothing.
//
// A device may be held with UnknownBroker (known online from the stored
// state, not heard since): any broker's will counts for it. Births holds
// online devices only; it is not safe for concurrent use.
type Births map[string]int8

// UnknownBroker marks a device whose broker is not known.
const UnknownBroker int8 = -1

// Keep records a birth (online) or will of device id from broker b, and
// reports whether it changes the device's state: a will from another
// broker than its last birth's does not.
func (w Births) Keep(id string, b int8, online bool) bool {
	if online {
		w[id] = b
		return true
	}
	if last, ok := w[id]; ok && last != UnknownBroker && last != b {
		return false
	}
	delete(w, id)
	return true
}
