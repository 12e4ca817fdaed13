package bench

import (
	"testing"

	"devicehub/bench/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }
