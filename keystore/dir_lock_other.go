//go:build !unix

package keystore

// Lock implements Locker; without flock(2) it only reports that nothing
// was cleaned.
func (d OSDir) Lock() (unlock func(), removed []string, err error) {
	return func() {}, nil, nil
}
