package open_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
	"github.com/idemgo/idem/cmd/idemctl/internal/open"
	idemgorm "github.com/idemgo/idem/stores/gorm"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Store opens the store a --dsn names, checked and ready for the commands:
// here an SQLite file whose table the application created.
func Example() {
	dir, err := os.MkdirTemp("", "idemctl-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "idem.db")

	// The application's own start-up: its store, migrated.
	db, err := gorm.Open(sqlite.Open(idemgorm.SQLiteDSN(path, 5*time.Second)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		fmt.Println(err)
		return
	}
	app, err := idemgorm.New(db)
	if err == nil {
		err = app.Migrate(context.Background())
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	sqlDB, _ := db.DB()
	_ = sqlDB.Close()

	// What idemctl does with --dsn sqlite:PATH.
	d, err := dsn.Parse("sqlite:"+path, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	o, err := open.Store(context.Background(), d, "", "")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer o.Close()
	recs, err := o.Store.ListStale(context.Background(), 10)
	fmt.Println(d.Kind, len(recs), err)
	// Output: sqlite 0 <nil>
}
