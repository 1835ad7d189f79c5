package sqlscan

import "testing"

func TestLockTarget(t *testing.T) {
	for _, c := range []struct {
		src, table, col string
		param           int
		lit             int64
		key, orderBy    bool
	}{
		{"UPDATE accounts SET balance = balance - $1 WHERE id = $2", "accounts", "id", 2, 0, true, false},
		{"update public.accounts a set x = 1 where a.id = ? and y = ?", "public.accounts", "id", 1, 0, true, false},
		{"DELETE FROM ONLY jobs WHERE id = 42 RETURNING *", "jobs", "id", 0, 42, true, false},
		{"SELECT * FROM jobs j JOIN runs r ON r.job = j.id WHERE j.id = $1 FOR UPDATE OF j", "jobs", "id", 1, 0, true, false},
		{"SELECT * FROM jobs WHERE state = 'new' ORDER BY id FOR UPDATE", "jobs", "state", 0, 0, false, true},
		{"SELECT * FROM jobs WHERE id = $1 OR id = $2 FOR UPDATE", "jobs", "", 0, 0, false, false},
		{"SELECT * FROM jobs WHERE id >= $1 FOR UPDATE", "jobs", "", 0, 0, false, false},
		{"SELECT * FROM (SELECT * FROM jobs ORDER BY id) s FOR UPDATE", "", "", 0, 0, false, false},
		{"WITH x AS (SELECT 1) UPDATE t SET v = 1", "", "", 0, 0, false, false},
	} {
		tg := LockTarget(c.src, Postgres)
		if tg.Table != c.table || tg.HasKey != c.key || tg.OrderBy != c.orderBy || c.key && (tg.Column != c.col || tg.Param != c.param || tg.Literal != c.lit) {
			t.Errorf("%s:\n got %+v", c.src, tg)
		}
	}
}
