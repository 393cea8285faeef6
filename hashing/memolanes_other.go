//go:build !amd64

package hashing

// laneRun16 is laneRun16Go where there is no assembly version (see memolanes_amd64.go).
func laneRun16(ka, kb *laneKeys, p *int32, n int, la, lb uint64, outA, outB *uint64) (uint64, uint64) {
	return laneRun16Go(ka, kb, p, n, la, lb, outA, outB)
}
